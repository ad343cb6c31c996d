"""Write resources/prompts/default.jsonl: the default prompt set for the embedded SmolLM2 target.

Deterministic (fixed seed, no network): templates x topics per task family, shuffled with a
seeded RNG and cut to a quota per family, then exact duplicates removed. Rows use the OpenAI
`{"messages": [...]}` format. Single-turn rows hold only the user turn (the target writes the
answers when regenerate.enabled is true); multi-turn rows carry short hand-written assistant
turns, which regeneration replaces.

    python resources/prompts/make_default_prompts.py [OUT]
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path

SEED = 20261129

EXPLAIN_TOPICS = [
    "photosynthesis", "gravity", "the water cycle", "how vaccines work", "inflation", "black holes",
    "the internet", "electricity", "rainbows", "earthquakes", "the seasons", "tides", "volcanoes",
    "how a refrigerator works", "how airplanes fly", "compound interest", "the immune system",
    "recycling", "climate change", "the greenhouse effect", "DNA", "evolution", "the moon's phases",
    "why the sky is blue", "how batteries work", "supply and demand", "a budget", "solar power",
    "wind energy", "how a bill becomes a law", "the stock market", "machine learning",
    "a computer program", "encryption", "cloud computing", "how email works", "a search engine",
    "sleep", "digestion", "the heart", "muscles", "friction", "magnets", "sound waves", "light",
    "atoms", "the periodic table", "static electricity", "how bees make honey", "migration of birds",
    "the Roman Empire", "the printing press", "democracy", "taxes", "interest rates", "a credit score",
]
EXPLAIN_TEMPLATES = [
    "Explain {t} in simple terms.",
    "Can you explain {t} to a ten-year-old?",
    "Tell me about {t}. Keep it short.",
    "Give me a brief explanation of {t}.",
    "How would you describe {t} in two or three sentences?",
]

PASSAGES = [
    "The city council voted on Tuesday to build a new public library downtown. Construction will start next spring and is expected to take two years.",
    "Regular exercise improves mood, helps with sleep and lowers the risk of heart disease. Even a short daily walk can make a difference.",
    "Honeybees live in colonies with one queen, thousands of workers and a few drones. Workers collect nectar and pollen and care for the young.",
    "The company reported higher sales this quarter, mostly thanks to its new phone. However, costs also rose because of shipping delays.",
    "Tomatoes grow best in full sun with regular watering. Plant them after the last frost and support the stems as they grow.",
    "The museum will be closed on Monday for cleaning. It reopens on Tuesday at nine with a new exhibition about ancient Egypt.",
    "Many people drink coffee in the morning to feel awake. Caffeine blocks a brain chemical that makes us feel tired.",
    "A volcano erupted on a remote island last week. No one was hurt, but nearby flights were cancelled because of the ash cloud.",
    "Our team finished the project two days early. The client was happy with the results and asked us to start a second phase.",
    "Drinking enough water helps the body control temperature, protect joints and remove waste. Most adults need several glasses a day.",
    "The train to the coast leaves every hour from platform four. Tickets are cheaper if you buy them online before the trip.",
    "Electric cars are becoming more popular as batteries get cheaper. Charging stations are also appearing in more cities.",
    "The school will hold a bake sale on Friday to raise money for new books. Parents are invited to bring cakes and cookies.",
    "Owls hunt mostly at night. Their large eyes and very good hearing help them find mice in the dark.",
    "The new park has a playground, a small lake and walking paths. It opened last weekend and hundreds of families visited.",
    "Reading before bed can help you relax. Experts suggest a paper book instead of a screen, because bright light can keep you awake.",
    "The bakery on Main Street is moving to a bigger shop next month. The owners say they will add a cafe with ten tables.",
    "Scientists found a new species of frog in the rainforest. It is smaller than a coin and has bright orange spots.",
    "Learning a new language takes time. Practicing a little every day works better than studying for hours once a week.",
    "The storm knocked down trees and power lines across the region. Crews expect to restore electricity to most homes by tomorrow.",
    "Our weekly meeting is moved from Wednesday to Thursday at ten. Please bring your progress notes and any questions.",
    "Recycling paper saves trees and energy. Clean paper and cardboard can be turned into new boxes and newspapers.",
    "The football team won the final three to one. Their captain scored twice in the second half.",
    "A good night's sleep helps memory and concentration. Adults usually need seven to nine hours each night.",
]
SUMMARIZE_TEMPLATES = [
    "Summarize this in one sentence: {p}",
    "Give me a short summary of the following text: {p}",
    "What is the main point of this paragraph? {p}",
]

LIST_TOPICS = [
    "fruits that are high in vitamin C", "ways to save money on groceries", "indoor hobbies",
    "tips for better sleep", "things to pack for a beach trip", "healthy breakfast ideas",
    "popular programming languages", "planets in our solar system", "ways to reduce stress",
    "famous painters", "board games for families", "uses for baking soda", "vegetables that grow fast",
    "common job interview questions", "ways to stay focused while studying", "animals that live in the ocean",
    "easy dinner recipes", "benefits of reading", "things to do on a rainy day", "countries in South America",
    "ways to be more productive", "musical instruments", "outdoor activities for kids", "signs of dehydration",
    "ways to save energy at home", "classic novels", "safety tips for cycling", "herbs you can grow indoors",
    "ways to make new friends", "types of clouds", "kitchen tools every cook needs", "mammals that can fly or glide",
    "good habits for a morning routine", "questions to ask a doctor", "ways to reduce plastic waste",
    "birthday party themes", "reasons to learn a second language", "things to check before a road trip",
    "low-cost date ideas", "ways to keep a houseplant alive",
]
LIST_TEMPLATES = [
    "List five {t}.",
    "Give me three {t}.",
    "What are some {t}? A short list is fine.",
    "Name four {t}.",
]

COMPARE_PAIRS = [
    ("cats", "dogs"), ("tea", "coffee"), ("a laptop", "a desktop computer"), ("renting", "buying a home"),
    ("Python", "JavaScript"), ("trains", "planes for travel"), ("e-books", "paper books"), ("running", "swimming"),
    ("a debit card", "a credit card"), ("weather", "climate"), ("a virus", "bacteria"), ("stocks", "bonds"),
    ("the sun", "the moon"), ("summer", "winter"), ("city life", "country life"), ("solar power", "wind power"),
    ("a lake", "a sea"), ("frogs", "toads"), ("a crocodile", "an alligator"), ("baking", "frying"),
    ("email", "a phone call"), ("a list", "a tuple in Python"), ("RAM", "storage"), ("a hurricane", "a tornado"),
    ("working from home", "working in an office"), ("butter", "margarine"), ("walking", "cycling to work"),
    ("a novel", "a short story"), ("monkeys", "apes"), ("an ocean", "a river"), ("tennis", "badminton"),
    ("savings accounts", "checking accounts"), ("HTTP", "HTTPS"), ("a fruit", "a vegetable"),
]
COMPARE_TEMPLATES = [
    "Compare {a} and {b}.",
    "What is the difference between {a} and {b}?",
    "What are the pros and cons of {a} versus {b}?",
]

HOWTO_TASKS = [
    "boil an egg", "make a cup of tea", "tie a tie", "change a flat tire", "write a resume",
    "start a vegetable garden", "learn to juggle", "clean a laptop keyboard", "make pancakes",
    "plan a budget", "improve my handwriting", "back up my phone", "remove a coffee stain",
    "fall asleep faster", "start running as a beginner", "make a paper airplane", "cook rice",
    "prepare for a job interview", "learn to type faster", "organize my closet", "save for a vacation",
    "take better photos with my phone", "make a simple salad", "write a thank-you note", "meditate",
    "study for an exam", "keep my houseplants healthy", "make cold brew coffee", "stop procrastinating",
    "give a short speech", "wash a wool sweater", "set up a home Wi-Fi network", "create a strong password",
    "make friends in a new city", "bake bread", "train a puppy to sit", "fix a squeaky door",
    "start a journal", "learn basic chess", "make homemade lemonade", "pack a suitcase efficiently",
    "reduce screen time", "care for a cast iron pan", "write a good email subject line",
]
HOWTO_TEMPLATES = [
    "How do I {t}?",
    "What are the steps to {t}?",
    "Give me simple instructions to {t}.",
    "Can you help me {t}? Explain briefly.",
]

POEM_SUBJECTS = [
    "the ocean", "autumn leaves", "a rainy morning", "the moon", "friendship", "a cat sleeping in the sun",
    "mountains", "the first snow", "a cup of coffee", "city lights at night", "a garden in spring",
    "an old tree", "the stars", "a long train ride", "summer evenings", "a lighthouse", "a lost sock",
    "the wind", "a quiet library", "birthdays", "a river", "a robot learning to love", "the desert",
    "home", "a busy kitchen", "butterflies", "the sunrise", "a thunderstorm", "my grandmother's garden",
    "a snowman", "Monday mornings", "the sea at night", "a bicycle", "hope",
]
POEM_TEMPLATES = [
    "Write a short poem about {t}.",
    "Write a haiku about {t}.",
    "Write a four-line rhyming poem about {t}.",
]

STORY_SUBJECTS = [
    "a dragon who is afraid of the dark", "a girl who finds a magic key", "a robot that wants to paint",
    "a lost puppy finding its way home", "two friends on a camping trip", "a talking tree",
    "a boy who can speak to birds", "a kingdom without music", "a cat who becomes mayor",
    "a spaceship crew finding a new planet", "a baker who bakes a giant cake", "a turtle who wins a race",
    "a wizard who forgot his spells", "a mouse living in a library", "a pirate looking for treasure",
    "a snowflake's journey", "a detective solving a mystery at school", "a child who plants a magic seed",
    "an old man and his dog", "a city where it always rains", "a penguin who wants to fly",
    "a robot and a little girl", "a lighthouse keeper", "a day without electricity",
    "a knight who is afraid of horses", "a fox who learns to share",
]
STORY_TEMPLATES = [
    "Write a very short story about {t}.",
    "Tell me a short bedtime story about {t}.",
    "Write a story in five sentences about {t}.",
]

EMAIL_CASES = [
    ("my manager", "asking for a day off next Friday"), ("a colleague", "thanking them for their help on a project"),
    ("my landlord", "reporting a leaking faucet"), ("a teacher", "explaining why my child missed school"),
    ("a customer", "apologizing for a late delivery"), ("a friend", "inviting them to dinner on Saturday"),
    ("the team", "announcing a new meeting time"), ("a hiring manager", "following up after an interview"),
    ("a neighbor", "asking them to water my plants while I am away"), ("a client", "sending the final report"),
    ("my professor", "asking for an extension on an assignment"), ("a hotel", "asking about late check-in"),
    ("a shop", "asking about a refund for a broken item"), ("a new coworker", "welcoming them to the team"),
    ("a supplier", "asking for a price quote"), ("my family", "sharing plans for the holidays"),
    ("a restaurant", "booking a table for six people"), ("the support team", "reporting a login problem"),
    ("a volunteer group", "thanking them for their work"), ("my gym", "cancelling my membership"),
]
EMAIL_TEMPLATES = [
    "Write a short email to {who} {what}.",
    "Draft a polite email to {who} {what}.",
    "Help me write a brief message to {who} {what}.",
]

CODE_TASKS = [
    "reverses a string", "checks if a number is prime", "returns the largest number in a list",
    "counts the vowels in a string", "computes the factorial of a number", "checks if a word is a palindrome",
    "removes duplicates from a list", "converts Celsius to Fahrenheit", "returns the Fibonacci numbers up to n",
    "sorts a list of names alphabetically", "counts how often each word appears in a sentence",
    "checks if a year is a leap year", "sums the even numbers in a list", "merges two dictionaries",
    "finds the average of a list of numbers", "capitalizes the first letter of every word",
    "reads a text file and counts its lines", "flattens a list of lists", "checks if two strings are anagrams",
    "returns the second smallest number in a list", "converts a list of strings to uppercase",
    "calculates the area of a circle", "finds the greatest common divisor of two numbers",
    "generates a random password", "returns the number of days between two dates",
]
CODE_LANGS = ["Python", "JavaScript"]
CODE_TEMPLATES = [
    "Write a {lang} function that {t}.",
    "Show me a short {lang} example that {t}.",
]
CODE_QUESTIONS = [
    "What does a for loop do in Python?", "What is the difference between a list and a dictionary in Python?",
    "What is a variable in programming?", "How do I print text in JavaScript?", "What is a function?",
    "What does `git commit` do?", "What is an API?", "What is recursion? Give a small example.",
    "How do I write a comment in Python?", "What is the difference between == and = in Python?",
    "What is JSON?", "How do I read user input in Python?", "What is an if statement?",
    "What does HTML stand for?", "What is a bug in software?", "How do I install a Python package?",
]

NAMES = ["Tom", "Anna", "Liam", "Sofia", "Omar", "Mia", "Ravi", "Emma", "Kenji", "Lucy", "Diego", "Zara"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "stamps", "shells"]


def math_problems(rng: random.Random, n: int) -> list[str]:
    """Word problems with seeded numbers; small enough for a 135M model to try."""
    forms = [
        lambda a, b, c, x, y: f"{x} has {a} {y} and buys {b} more. How many {y} does {x} have now?",
        lambda a, b, c, x, y: f"{x} had {a + b} {y} and gave {b} to a friend. How many are left?",
        lambda a, b, c, x, y: f"A box holds {c} {y}. How many {y} are in {b} boxes?",
        lambda a, b, c, x, y: f"{x} shares {b * c} {y} equally among {c} friends. How many does each friend get?",
        lambda a, b, c, x, y: f"A shirt costs ${a}. It is on sale for {c * 5}% off. What is the sale price?",
        lambda a, b, c, x, y: f"A train travels {a * 10} km in {c} hours. What is its average speed?",
        lambda a, b, c, x, y: f"{x} reads {b} pages a day. How many pages does {x} read in {c + 3} days?",
        lambda a, b, c, x, y: f"What is {a} times {b}?",
        lambda a, b, c, x, y: f"What is {a * 7} divided by 7?",
        lambda a, b, c, x, y: f"A rectangle is {a} cm long and {b} cm wide. What is its area?",
        lambda a, b, c, x, y: f"What is {c * 10}% of {a * 10}?",
        lambda a, b, c, x, y: f"If a pizza is cut into {2 * c} slices and {x} eats {c - 1}, what fraction is left?",
        lambda a, b, c, x, y: f"{x} is {a} years old. How old will {x} be in {b} years?",
        lambda a, b, c, x, y: f"Solve for x: x + {a} = {a + b}.",
        lambda a, b, c, x, y: f"Solve for x: {c}x = {c * b}.",
        lambda a, b, c, x, y: f"A movie starts at 7:{10 + c:02d} pm and lasts {90 + b} minutes. When does it end?",
    ]
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        form = rng.choice(forms)
        text = form(rng.randint(3, 40), rng.randint(2, 12), rng.randint(2, 6), rng.choice(NAMES), rng.choice(ITEMS))
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


DEFINE_WORDS = [
    "ephemeral", "algorithm", "metaphor", "ecosystem", "empathy", "molecule", "nostalgia",
    "entrepreneur", "biodiversity", "hypothesis", "irony", "latitude", "procrastination",
    "resilience", "mindfulness", "bandwidth", "curious", "generous", "ancient", "fragile",
    "abundant", "diligent", "serendipity", "sustainable",
]
DEFINE_WORD_TEMPLATES = [
    'What does the word "{t}" mean?',
    'Define "{t}".',
    'What is the meaning of "{t}"? Use it in a sentence.',
]
DEFINE_CONCEPTS = [
    "a noun", "an adjective", "a synonym", "a mammal", "a continent", "a galaxy", "a mortgage",
    "a firewall", "an idiom", "a prime number", "a fossil", "a verb", "a pronoun", "a simile",
    "a peninsula", "a glacier", "an omnivore", "a fraction", "a percentage", "renewable energy",
    "a carbon footprint",
]
DEFINE_CONCEPT_TEMPLATES = ["What is {t}?", "What is {t}? Give an example."]

TRIVIA = [
    "What is the capital of France?", "What is the capital of Japan?", "What is the capital of Canada?",
    "What is the capital of Australia?", "What is the capital of Italy?", "What is the capital of Brazil?",
    "What is the capital of Egypt?", "What is the capital of Spain?", "What is the capital of Germany?",
    "What is the capital of Kenya?", "What is the capital of India?", "What is the capital of Mexico?",
    "Who wrote Romeo and Juliet?", "Who painted the Mona Lisa?", "Who wrote Pride and Prejudice?",
    "Who discovered penicillin?", "Who was the first person to walk on the moon?",
    "Who invented the telephone?", "Who developed the theory of relativity?",
    "What is the largest planet in our solar system?", "What is the smallest planet in our solar system?",
    "What is the largest ocean on Earth?", "What is the longest river in the world?",
    "What is the tallest mountain in the world?", "How many continents are there?",
    "How many days are in a leap year?", "How many legs does a spider have?", "How many sides does a hexagon have?",
    "What is the boiling point of water in Celsius?", "What is the chemical symbol for gold?",
    "What gas do plants absorb from the air?", "What is the hardest natural substance?",
    "What is the freezing point of water in Fahrenheit?", "Which planet is known as the Red Planet?",
    "What is the largest mammal?", "What is the fastest land animal?", "What do bees make?",
    "What language is spoken in Brazil?", "What is the main ingredient in guacamole?",
    "How many minutes are in an hour?", "What is the square root of 81?", "How many players are on a soccer team?",
    "In which country are the pyramids of Giza?", "What is the currency of Japan?",
    "What is H2O?", "Which organ pumps blood through the body?", "What is the closest star to Earth?",
    "What color do you get when you mix blue and yellow?", "How many hours are in a day?",
    "What is the largest desert in the world?", "Which animal is known as the king of the jungle?",
    "What instrument has 88 keys?", "How many strings does a standard guitar have?",
    "What is the opposite of hot?", "Which season comes after winter?", "What is the capital of Norway?",
    "What is the national language of Germany?", "Who wrote the Odyssey?", "What is the speed of light, roughly?",
    "How many bones are in the adult human body?", "What is the largest country by area?",
]

ADVICE_TOPICS = [
    "staying motivated at the gym", "learning to cook", "managing my time at work", "being a better listener",
    "studying for a math test", "saving money each month", "starting a small business", "eating healthier",
    "keeping a conversation going", "dealing with a difficult coworker", "preparing for a marathon",
    "moving to a new city", "writing a good essay", "learning to play the guitar", "taking care of a new kitten",
    "keeping my desk tidy", "speaking in public", "drinking more water", "working from home", "planning a wedding",
    "getting better grades", "reading more books", "traveling on a budget", "growing tomatoes",
]
ADVICE_TEMPLATES = [
    "Give me some tips for {t}.",
    "What advice do you have for {t}?",
    "I need help with {t}. Any suggestions?",
]

REWRITE_SENTENCES = [
    "me and him goes to the store yesterday", "their going to the park later", "i has three dog and a cat",
    "the meeting have been moved to monday", "she dont like apples", "we was late because of the traffic",
    "can you sends me the file", "he runned very fast in the race", "this are my favorite book",
    "I am writing to inform you that the package, which was sent, has been delayed by some days.",
    "hey can u come to the thing tmrw", "The results of the test were not very good at all.",
    "We need to make a decision about the thing soon.", "I think that maybe we should possibly leave now.",
    "the weather is nice today so lets go outside", "Thanks for the gift, I really like it a lot.",
]
REWRITE_TEMPLATES = [
    "Fix the grammar in this sentence: {t}",
    "Rewrite this more formally: {t}",
    "Make this sentence clearer: {t}",
]

TRANSLATE_PHRASES = ["hello", "thank you", "good morning", "where is the train station?", "I love books",
                     "how much does this cost?", "good night", "see you tomorrow", "my name is Anna", "please"]
TRANSLATE_LANGS = ["Spanish", "French", "German", "Italian"]
TRANSLATE_TEMPLATES = [
    'How do you say "{t}" in {lang}?',
    'Translate "{t}" into {lang}.',
]

IDEA_TASKS = [
    "names for a pet goldfish", "themes for a school science fair project", "gift ideas for a teacher",
    "names for a coffee shop", "activities for a team-building day", "titles for a blog about cooking",
    "weekend projects for a beginner woodworker", "ideas for a healthy lunch box", "slogans for a bike shop",
    "questions to ask on a first date", "names for a fantasy kingdom", "fun facts to share with kids",
    "ideas for a short film", "ways to celebrate a friend's promotion", "names for a robot",
]
IDEA_TEMPLATES = ["Suggest some {t}.", "Brainstorm {t}.", "Can you come up with {t}?"]

SENTIMENT_TEXTS = [
    "The food was cold and the waiter ignored us.", "Best concert I have ever been to!",
    "The phone works, but the battery dies too fast.", "I would happily stay at this hotel again.",
    "The movie was long and boring.", "Great value for the price, highly recommended.",
    "The package arrived broken and nobody answered my emails.", "The staff were friendly and helpful.",
    "It is okay, nothing special.", "This book made me laugh and cry.", "Terrible customer service.",
    "The shoes are comfortable and look great.",
]
SENTIMENT_TEMPLATES = [
    'Is this review positive or negative? "{t}"',
    'What is the sentiment of this sentence: "{t}"',
]

CHAT = [
    "Hi! How are you today?", "Tell me a joke.", "Tell me a fun fact about octopuses.",
    "What can you help me with?", "I'm bored. What should I do?", "Good morning!",
    "Tell me something interesting about space.", "Can you recommend a good book for a long trip?",
    "What is your favorite color, and why?", "Say something nice to cheer me up.",
    "Tell me a riddle.", "What should I cook for dinner tonight?", "Tell me a fun fact about history.",
    "I just finished my exams!", "Give me a motivational quote.", "What's a good name for a cat?",
    "Can you tell me a short joke about computers?", "What is a fun thing to do this weekend?",
    "I had a long day at work. Any ideas to relax?", "What is a good movie for a family night?",
]

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a concise assistant. Answer in at most three sentences.",
    "You are a friendly tutor who explains things to high school students.",
    "You are a polite customer support agent.",
    "You are a cheerful assistant who likes to use simple words.",
    "You are an expert cook who gives practical kitchen advice.",
    "You are a careful assistant. If you are not sure, say so.",
    "You are a writing assistant that keeps answers short and clear.",
]

MULTI_TURN = [
    [("What is the capital of Spain?", "The capital of Spain is Madrid."),
     ("What is it famous for?", "Madrid is known for its art museums, like the Prado, its parks and its food.")],
    [("Can you give me a simple pancake recipe?", "Mix 1 cup flour, 1 egg, 1 cup milk and a pinch of salt, then cook small rounds in a hot pan."),
     ("How do I make them fluffier?", "Add a teaspoon of baking powder and let the batter rest for ten minutes.")],
    [("What is 12 times 8?", "12 times 8 is 96."),
     ("And if I divide that by 4?", "96 divided by 4 is 24.")],
    [("Suggest a name for my new puppy.", "How about Biscuit? It is short, friendly and easy to call."),
     ("Something more unusual, please.", "You could try Pixel, Juniper or Moose.")],
    [("Write a haiku about rain.", "Soft rain on the roof / the garden drinks quietly / grey clouds drift away"),
     ("Now one about sunshine.", "Warm light on my face / shadows stretch across the grass / the day opens wide")],
    [("What is a noun?", "A noun is a word that names a person, place, thing or idea, like 'dog' or 'city'."),
     ("Give me three examples in a sentence.", "The teacher put the book on the table.")],
    [("How do I say 'thank you' in French?", "You say 'merci'."),
     ("And 'thank you very much'?", "You say 'merci beaucoup'.")],
    [("I want to start running. Any advice?", "Start slowly: run for one minute, walk for two, and repeat for twenty minutes, three times a week."),
     ("How long until I can run 5 km?", "Many beginners can run 5 km after about eight to ten weeks of steady practice.")],
    [("Write a Python function that adds two numbers.", "def add(a, b):\n    return a + b"),
     ("Now make it add a list of numbers.", "def add_all(numbers):\n    return sum(numbers)")],
    [("What causes rain?", "Water vapor rises, cools and forms clouds; when the droplets grow heavy, they fall as rain."),
     ("Why is some rain heavier than other rain?", "Heavier rain comes from taller clouds with more moisture and stronger updrafts.")],
    [("Recommend a board game for four people.", "Ticket to Ride is easy to learn and fun for four players."),
     ("Is there a cooperative one?", "Pandemic is a popular cooperative game where players work together.")],
    [("What is the largest planet?", "Jupiter is the largest planet in our solar system."),
     ("How many moons does it have?", "Jupiter has dozens of known moons; the four largest are Io, Europa, Ganymede and Callisto.")],
    [("Help me write a short birthday message for my sister.", "Happy birthday! I hope your day is full of laughter, cake and people who love you."),
     ("Make it funnier.", "Happy birthday! Don't worry about getting older, you're still younger than you will be next year.")],
    [("What is a healthy breakfast?", "Oatmeal with fruit and nuts, or eggs with whole-grain toast, are good choices."),
     ("I only have five minutes.", "Try yogurt with a banana and a handful of granola.")],
    [("Explain what a budget is.", "A budget is a plan for how you will spend and save your money each month."),
     ("How do I make one?", "List your income, list your expenses, and decide how much to save before you spend the rest.")],
    [("Tell me a joke.", "Why did the scarecrow win an award? Because he was outstanding in his field."),
     ("Another one, please.", "What do you call a fake noodle? An impasta.")],
    [("Is a tomato a fruit?", "Yes. Botanically, a tomato is a fruit because it grows from a flower and holds seeds."),
     ("Then why do we call it a vegetable?", "In cooking it is used in savory dishes, so people usually treat it as a vegetable.")],
    [("What should I pack for a weekend hike?", "Water, snacks, a map, a rain jacket, sunscreen and a small first-aid kit."),
     ("What about shoes?", "Wear comfortable hiking shoes or boots that you have already broken in."),
     ("Thanks! Any safety tips?", "Tell someone your route, check the weather, and turn back if conditions get worse.")],
    [("What is photosynthesis?", "Photosynthesis is how plants use sunlight, water and carbon dioxide to make sugar and oxygen."),
     ("Where does it happen in the plant?", "It happens mostly in the leaves, inside tiny parts called chloroplasts."),
     ("Why are leaves green?", "Chlorophyll, the pigment in chloroplasts, reflects green light.")],
    [("Can you help me plan a study schedule?", "Sure. How many subjects do you have and how many hours a day can you study?"),
     ("Three subjects and two hours a day.", "Study two subjects for about 50 minutes each with a short break, and rotate the third in every other day."),
     ("What should I do in the breaks?", "Stand up, stretch, drink water and stay away from your phone.")],
]

# Task family -> (prompts, how many single-turn rows to keep).
QUOTAS = {
    "explain": 80, "summarize": 40, "list": 65, "compare": 45, "howto": 70, "poem": 45, "story": 45,
    "email": 40, "code": 55, "math": 70, "define": 55, "trivia": 60, "advice": 40, "rewrite": 25,
    "translate": 20, "ideas": 20, "sentiment": 12, "chat": 18,
}
N_SYSTEM = 40


def fill(templates, values, key="t"):
    return [tpl.format(**{key: v}) for tpl, v in itertools.product(templates, values)]


def families(rng: random.Random) -> dict[str, list[str]]:
    return {
        "explain": fill(EXPLAIN_TEMPLATES, EXPLAIN_TOPICS),
        "summarize": fill(SUMMARIZE_TEMPLATES, PASSAGES, "p"),
        "list": fill(LIST_TEMPLATES, LIST_TOPICS),
        "compare": [tpl.format(a=a, b=b) for tpl, (a, b) in itertools.product(COMPARE_TEMPLATES, COMPARE_PAIRS)],
        "howto": fill(HOWTO_TEMPLATES, HOWTO_TASKS),
        "poem": fill(POEM_TEMPLATES, POEM_SUBJECTS),
        "story": fill(STORY_TEMPLATES, STORY_SUBJECTS),
        "email": [tpl.format(who=w, what=x) for tpl, (w, x) in itertools.product(EMAIL_TEMPLATES, EMAIL_CASES)],
        "code": [tpl.format(lang=lang, t=t) for tpl, lang, t in itertools.product(CODE_TEMPLATES, CODE_LANGS, CODE_TASKS)]
        + CODE_QUESTIONS,
        "math": math_problems(rng, 160),
        "define": fill(DEFINE_WORD_TEMPLATES, DEFINE_WORDS) + fill(DEFINE_CONCEPT_TEMPLATES, DEFINE_CONCEPTS),
        "trivia": list(TRIVIA),
        "advice": fill(ADVICE_TEMPLATES, ADVICE_TOPICS),
        "rewrite": fill(REWRITE_TEMPLATES, REWRITE_SENTENCES),
        "translate": [tpl.format(t=t, lang=lang) for tpl, t, lang in itertools.product(TRANSLATE_TEMPLATES, TRANSLATE_PHRASES, TRANSLATE_LANGS)],
        "ideas": fill(IDEA_TEMPLATES, IDEA_TASKS),
        "sentiment": fill(SENTIMENT_TEMPLATES, SENTIMENT_TEXTS),
        "chat": list(CHAT),
    }


def build_rows(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    # A prompt that opens a multi-turn conversation is not repeated as a single-turn row.
    taken = {turns[0][0] for turns in MULTI_TURN}
    chosen: list[str] = []
    leftovers: list[str] = []
    for family, prompts in families(rng).items():
        pool = [p for p in dict.fromkeys(prompts) if p not in taken]
        rng.shuffle(pool)
        quota = QUOTAS[family]
        if len(pool) < quota:
            raise ValueError(f"family {family}: only {len(pool)} prompts for a quota of {quota}")
        chosen += pool[:quota]
        leftovers += pool[quota:]

    rows = [{"messages": [{"role": "user", "content": p}]} for p in chosen]
    rng.shuffle(leftovers)
    for i, prompt in enumerate(leftovers[:N_SYSTEM]):
        rows.append({"messages": [
            {"role": "system", "content": SYSTEM_PROMPTS[i % len(SYSTEM_PROMPTS)]},
            {"role": "user", "content": prompt},
        ]})
    for turns in MULTI_TURN:
        messages = []
        for user, assistant in turns:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
        rows.append({"messages": messages})
    rng.shuffle(rows)

    keys = [json.dumps(r, sort_keys=True) for r in rows]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate rows")  # templates x topics should never repeat a row
    return rows


def main(out: str | Path) -> None:
    rows = build_rows()
    out = Path(out)
    with out.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).with_name("default.jsonl"))
